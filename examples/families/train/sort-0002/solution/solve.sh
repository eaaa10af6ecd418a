#!/bin/bash
sort list.txt > output.txt
