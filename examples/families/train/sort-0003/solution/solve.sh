#!/bin/bash
sort values.txt > final.txt
