#!/bin/bash
sort input.txt > final.txt
