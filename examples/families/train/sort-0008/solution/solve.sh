#!/bin/bash
sort list.txt > summary.txt
